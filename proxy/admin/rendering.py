"""Jinja2 templates (autoescape always on) and the helpers the pages share."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from markupsafe import Markup, escape
from starlette.requests import Request
from starlette.responses import HTMLResponse

from proxy.admin.auth import COOKIE as ADMIN_COOKIE
from proxy.admin.security import CSRF_FIELD, CsrfState
from proxy.services import Services

HERE = Path(__file__).parent
KINDS_THAT_NEVER_COMPRESS = ("windowed", "full", "none")


def when(timestamp: float | None) -> str:
    if not timestamp:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(timestamp))


def ago(timestamp: float | None) -> str:
    if not timestamp:
        return ""
    seconds = max(0, int(time.time() - timestamp))
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return "just now"


def agent_url(agent: str, *rest: str, namespace: str | None = None, api: bool = False) -> str:
    """The page (or with ``api``, the JSON twin) of an agent or one of its sessions."""
    base = "/admin/api/agents/" if api else "/admin/agents/"
    path = base + "/".join(quote(part, safe="") for part in (agent, *rest))
    return path + ("?" + urlencode({"namespace": namespace}) if namespace else "")


MEDIA_LINE = re.compile(r"^\[(?:image|document|audio|Attachments): .*\]$")


def media_lines(text: str) -> Markup:
    """The text, escaped, with each line that names a media part marked for styling."""
    lines = []
    for line in str(text).split("\n"):
        escaped = escape(line)
        if MEDIA_LINE.match(line):
            escaped = Markup('<span class="media-line">{}</span>').format(line)
        lines.append(escaped)
    return Markup("\n").join(lines)


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


def percent(ratio: float | None) -> str:
    return f"{(ratio or 0) * 100:.1f}%"


def thousands(value: int | float | None) -> str:
    return f"{value:,}" if isinstance(value, int | float) else "—"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(when=when, ago=ago, pretty_json=pretty_json, percent=percent,
                       thousands=thousands, media_lines=media_lines)
    env.globals.update(agent_url=agent_url, csrf_field=CSRF_FIELD,
                       never_compress=KINDS_THAT_NEVER_COMPRESS)
    return env


ENV = _environment()


def render(
    request: Request, template: str, context: dict[str, Any], *, status_code: int = 200
) -> HTMLResponse:
    """Render a page with the CSRF token its forms need (issuing the cookie on first visit)."""
    services: Services = request.app.state.services
    csrf = CsrfState(request, services.settings)
    page = {
        "csrf_token": csrf.token,
        "signed_in": bool(request.cookies.get(ADMIN_COOKIE)),
        "token_configured": services.settings.admin_secret() is not None,
        "path": request.url.path,
        "nav": "",
        **context,
    }
    response = HTMLResponse(ENV.get_template(template).render(page), status_code=status_code)
    csrf.set_cookie(response)
    return response
