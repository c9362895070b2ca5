"""Every whole-number parameter of a console route is written in digits (`webui.numbers`).

One dependency of each console app (`WHOLE_NUMBERS`) checks the raw text of the matched
route's int query and path parameters before FastAPI hands them to pydantic, so a route added
later is covered without a word of its own; a refusal is the console's ordinary 422 naming the
parameter (`webui.errors`). Request bodies are checked by their models (JSON integers only).
"""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import Depends, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from webui.numbers import NOT_WHOLE, takes_int, written_whole


async def whole_numbers_only(request: Request) -> None:
    """422 for an int query or path parameter of the matched route that is not digits."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    errors = [
        {"type": "int_parsing", "loc": (where, name), "msg": NOT_WHOLE}
        for where, name in _int_params(route.dependant)
        if not all(written_whole(text) for text in _written(request, where, name))
    ]
    if errors:
        raise RequestValidationError(errors)


def _int_params(dependant: Dependant) -> Iterator[tuple[str, str]]:
    """("query" or "path", name) of each int parameter of a route and its dependencies."""
    for where, fields in (("path", dependant.path_params), ("query", dependant.query_params)):
        for field in fields:
            if takes_int(field.field_info.annotation):
                yield where, field.alias
    for sub in dependant.dependencies:
        yield from _int_params(sub)


def _written(request: Request, where: str, name: str) -> list[str]:
    if where == "query":
        return request.query_params.getlist(name)
    return [str(request.path_params[name])] if name in request.path_params else []


#: Give it to `FastAPI(dependencies=[...])`: every route of the app is checked.
WHOLE_NUMBERS = Depends(whole_numbers_only)
