"""The admin UI under ``/admin/``, its JSON twin under ``/admin/api/``, and admin auth."""
