"""Long multi-session conversations with questions that name their evidence turns.

``generate`` writes them deterministically (a seed, no data shipped beyond this code):
two speakers meeting over dated sessions, facts planted at known turns, some sessions
where the second speaker uses a tool and the fact lives in the tool's result, and
questions of five kinds (single-hop, multi-hop, temporal, knowledge update, tool), each
naming the ``dia_id`` of its evidence and the turn after which it is asked.

``read_locomo`` reads LoCoMo's file format (a JSON list of samples: ``conversation`` with
``speaker_a``, ``speaker_b``, ``session_N`` lists of ``{speaker, dia_id, text}`` and
``session_N_date_time``; ``qa`` with ``question``, ``answer``, ``evidence`` dia_ids and
``category``) from a copy the user points at. Its licence is non-commercial: the data is
never shipped with the project.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

# LoCoMo's question categories
LOCOMO_KINDS = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop",
                5: "adversarial"}


@dataclass
class Turn:
    speaker: str
    dia_id: str
    text: str
    # the second speaker called a tool first: {"name", "arguments", "result"}
    tool: dict[str, Any] | None = None


@dataclass
class Session:
    number: int
    date_time: str
    turns: list[Turn]


@dataclass
class Question:
    question: str
    answer: str
    evidence: list[str]
    kind: str
    # asked after this turn (None: after the whole conversation)
    ask_after: str | None = None


@dataclass
class Conversation:
    id: str
    speakers: tuple[str, str]
    sessions: list[Session]
    questions: list[Question]
    # the text of each evidence turn that counts as the evidence being present; by default
    # the turn's own text (a tool turn: its result)
    needles: dict[str, str] = field(default_factory=dict)

    def turns(self) -> list[Turn]:
        return [turn for session in self.sessions for turn in session.turns]

    def needle(self, dia_id: str) -> str:
        if dia_id in self.needles:
            return self.needles[dia_id]
        turn = next(t for t in self.turns() if t.dia_id == dia_id)
        return turn.tool["result"] if turn.tool else turn.text


# --- the generator ------------------------------------------------------------------------

_NAMES = ["Maren", "Tobias", "Ilse", "Quentin", "Noor", "Bastien", "Yara", "Emeric",
          "Solveig", "Darius", "Ottilie", "Leander"]
_TOPICS = {
    "cooking": ["a lentil stew", "sourdough", "a lemon tart", "dumplings", "a curry"],
    "hiking": ["the ridge trail", "a lake loop", "the old quarry path", "a forest walk"],
    "work": ["the quarterly review", "a new client", "the office move", "a deadline"],
    "music": ["a piano piece", "an old record", "a concert", "a choir rehearsal"],
    "books": ["a mystery novel", "a history of maps", "a poetry collection", "a biography"],
    "garden": ["the tomato plants", "a new hedge", "the compost heap", "some tulip bulbs"],
}
_FILLER = [
    "I spent part of the weekend on {thing}, and it went better than I expected.",
    "Honestly, {thing} took more time than I had planned for.",
    "We talked about {thing} for a while over dinner.",
    "I keep thinking about {thing}; it was a nice change of pace.",
    "A friend recommended {thing}, so I finally gave it a try.",
    "The weather was grey, which made {thing} feel even cosier.",
    "I told my neighbour about {thing} and she wants to join next time.",
    "Nothing dramatic happened, mostly {thing} and a lot of tea.",
]
_REPLIES = [
    "That sounds lovely. How did you feel afterwards?",
    "Oh nice, I have been meaning to try that myself.",
    "Ha, that is very you. Tell me more about it.",
    "I can picture it. Was it as good as last time?",
    "That reminds me of something similar I did a while ago.",
    "Good for you. I would have given up halfway, I think.",
]
_RELATIONS = ["sister", "cousin", "mentor", "landlord", "piano teacher", "business partner"]
_PETS = ["cat", "dog", "parrot", "tortoise"]
_BREEDS = ["a Maine Coon", "a border collie", "an African grey", "a Hermann's tortoise"]
_CITIES = ["Porto", "Tallinn", "Graz", "Ljubljana", "Bergen", "Lyon", "Ghent", "Bologna"]
_EVENTS = ["ran a half marathon", "passed the driving test", "sold the old car",
           "signed the lease", "finished the pottery course", "got the new job offer"]


def _word(rng: random.Random, n: int) -> str:
    """A made-up capitalised word, unique enough to be searched for."""
    syllables = ["ka", "lo", "mi", "ru", "te", "sa", "vo", "ne", "di", "pa", "zu", "ri"]
    return "".join(rng.choice(syllables) for _ in range(n)).capitalize()


def _date_text(moment: datetime) -> str:
    hour = moment.strftime("%I").lstrip("0")
    return f"{hour}:{moment.strftime('%M %p').lower()} on {moment.day} {moment:%B, %Y}"


def _tool_result(rng: random.Random, order: str, fact: str, size: int) -> str:
    """A bulky lookup result (``size`` records) with ``fact`` in its middle."""
    rows = [f"record {i}: order {rng.randint(10000, 99999)} status pending, "
            f"warehouse {rng.choice('ABCDEFG')}{rng.randint(1, 9)}, weight {rng.randint(1, 40)} kg"
            for i in range(size)]
    rows.insert(size // 2, fact)
    return f"lookup results for order {order}:\n" + "\n".join(rows)


class _Builder:
    def __init__(self, rng: random.Random, cid: str, speakers: tuple[str, str]) -> None:
        self.rng, self.cid, self.speakers = rng, cid, speakers
        self.sessions: list[Session] = []
        self.questions: list[Question] = []
        self.needles: dict[str, str] = {}

    def filler(self) -> str:
        topic = self.rng.choice(list(_TOPICS))
        count = self.rng.randint(1, 3)
        return " ".join(self.rng.choice(_FILLER).format(thing=self.rng.choice(_TOPICS[topic]))
                        for _ in range(count))

    def session(self, number: int, moment: datetime, turns: int,
                facts: list[tuple[int, int, str]], tool: dict[str, Any] | None) -> Session:
        """``facts``: (turn index, speaker index, sentence) planted as the turn's opening;
        a speaker's facts go to their own turns (even indexes: the first speaker's)."""
        planted = {index: (who, sentence) for index, who, sentence in facts}
        out: list[Turn] = []
        for index in range(turns):
            who = index % 2
            dia_id = f"D{number}:{index + 1}"
            text = self.filler() if who == 0 else self.rng.choice(_REPLIES)
            if index in planted:
                _, sentence = planted[index]
                text = f"{sentence} {text}"
                self.needles[dia_id] = sentence
            turn = Turn(self.speakers[who], dia_id, text)
            if tool is not None and index == tool["at"]:
                turn.tool = {k: tool[k] for k in ("name", "arguments", "result")}
                self.needles[dia_id] = tool["fact"]
            out.append(turn)
        session = Session(number, _date_text(moment), out)
        self.sessions.append(session)
        return session


def generate_conversation(seed: int, *, sessions: int = 16, turns: int = 18,
                          tool_every: int = 4, tool_rows: int = 40) -> Conversation:
    """One conversation of ``sessions`` dated sessions of ``turns`` turns each."""
    rng = random.Random(seed)
    a, b = rng.sample(_NAMES, 2)
    cid = f"gen-{seed}"
    build = _Builder(rng, cid, (a, b))
    moment = datetime(2023, 1, 9, 10, 0) + timedelta(days=rng.randint(0, 60))
    pending: list[tuple[int, Question]] = []  # (session asked at the end of, question)

    def ask(question: Question, evidence_session: int) -> None:
        later = rng.choice([evidence_session, rng.randint(evidence_session, sessions), None])
        pending.append((later if later is not None else sessions + 1, question))

    # facts of two turns (multi-hop, update) are planted in two sessions
    pet, breed = rng.choice(_PETS), rng.choice(_BREEDS)
    pet_name = _word(rng, 2)
    first_city, second_city = rng.sample(_CITIES, 2)
    multi_at = (rng.randint(1, sessions // 3), rng.randint(sessions // 2, sessions - 1))
    update_at = (rng.randint(1, sessions // 2), rng.randint(sessions // 2 + 1, sessions))
    for number in range(1, sessions + 1):
        tool: dict[str, Any] | None = None
        if tool_every and number % tool_every == 0:
            order = str(rng.randint(100000, 999999))
            city = rng.choice(_CITIES)
            fact = f"order {order}: delivered to {city} on {moment.day} {moment:%B}"
            tool = {"at": 1 + 2 * rng.randint(0, (turns - 3) // 2), "name": "lookup_order",
                    "arguments": {"order": order}, "fact": fact,
                    "result": _tool_result(rng, order, fact, tool_rows)}
        facts: list[tuple[int, int, str]] = []
        # each speaker's turns (even: the first speaker's), the tool's turn left out
        slots = [[i for i in range(turns - 1) if i % 2 == who and not (tool and i == tool["at"])]
                 for who in (0, 1)]
        for free in slots:
            rng.shuffle(free)

        def plant(who: int, sentence: str, slots: list[list[int]] = slots,
                  facts: list[tuple[int, int, str]] = facts, number: int = number) -> str:
            index = slots[who].pop()
            facts.append((index, who, sentence))
            return f"D{number}:{index + 1}"

        session_facts: list[tuple[str, Question]] = []
        relation = rng.choice(_RELATIONS)
        name = _word(rng, 3)
        who = rng.randint(0, 1)
        speaker = (a, b)[who]
        dia = plant(who, f"By the way, my {relation} is called {name}.")
        session_facts.append((dia, Question(f"What is the name of {speaker}'s {relation}?",
                                            name, [dia], "single-hop")))
        event = rng.choice(_EVENTS)
        dia = plant(0, f"Guess what, I {event} yesterday.")
        day = moment - timedelta(days=1)
        session_facts.append((dia, Question(f"When did {a} say they {event}?",
                                            f"{day.day} {day:%B %Y}", [dia], "temporal")))
        if number == multi_at[0]:
            multi_first = plant(1, f"We adopted a {pet} and named it {pet_name}.")
        if number == multi_at[1]:
            dia = plant(1, f"{pet_name} turned out to be {breed}, the vet says.")
            session_facts.append((dia, Question(f"What kind of {pet} does {b} have?", breed,
                                                [multi_first, dia], "multi-hop")))
        if number == update_at[0]:
            update_first = plant(0, f"I have just settled into a flat in {first_city}.")
        if number == update_at[1]:
            dia = plant(0, f"Big news: we moved again, this time to {second_city}.")
            session_facts.append((dia, Question(f"Which city does {a} live in now?",
                                                second_city, [update_first, dia], "update")))
        session = build.session(number, moment, turns, facts, tool)
        if tool is not None:
            dia = session.turns[tool["at"]].dia_id
            session_facts.append((dia, Question(f"Where was order {tool['arguments']['order']} "
                                                "delivered?", city, [dia], "tool")))
        for _, question in session_facts:
            ask(question, number)
        moment += timedelta(days=rng.randint(3, 20), hours=rng.randint(-3, 3))

    for asked, question in pending:
        if asked <= sessions:
            question.ask_after = build.sessions[asked - 1].turns[-1].dia_id
        build.questions.append(question)
    return Conversation(cid, (a, b), build.sessions, build.questions, build.needles)


def generate(count: int, *, seed: int = 29, **sizes: Any) -> list[Conversation]:
    return [generate_conversation(seed + n, **sizes) for n in range(count)]


# --- LoCoMo's format ----------------------------------------------------------------------

_SESSION = re.compile(r"^session_(\d+)$")


def read_locomo(path: Path) -> list[Conversation]:
    """Conversations and questions from a LoCoMo-format JSON file (a list of samples)."""
    data = json.loads(Path(path).read_text())
    if isinstance(data, dict):
        data = [data]
    conversations = []
    for index, sample in enumerate(data):
        raw = sample["conversation"]
        speakers = (str(raw.get("speaker_a", "A")), str(raw.get("speaker_b", "B")))
        numbers = sorted(int(m[1]) for key in raw if (m := _SESSION.match(key)))
        sessions = [
            Session(number, str(raw.get(f"session_{number}_date_time", "")), [
                Turn(str(t["speaker"]), str(t["dia_id"]), str(t.get("text", "")))
                for t in raw[f"session_{number}"]
            ])
            for number in numbers
        ]
        known = {t.dia_id for s in sessions for t in s.turns}
        questions = []
        for qa in sample.get("qa", []):
            # some evidence entries list several ids in one string ("D1:3; D1:4")
            evidence = [e for item in qa.get("evidence", [])
                        for e in re.split(r"[;,\s]+", str(item)) if e in known]
            if not evidence:
                continue
            category = qa.get("category")
            answer = qa.get("answer", qa.get("adversarial_answer", ""))
            questions.append(Question(str(qa.get("question", "")), str(answer), evidence,
                                      LOCOMO_KINDS.get(category, str(category))))
        conversations.append(Conversation(str(sample.get("sample_id", f"locomo-{index}")),
                                          speakers, sessions, questions))
    return conversations
