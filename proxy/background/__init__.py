"""Work after the reply: summarizing, compacting and the after-turn scheduler."""
