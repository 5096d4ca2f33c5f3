"""The schema registry's compatibility levels and modes (Confluent's ``/config`` and
``/mode``), global and per subject; the rest of its API is ``routers.schemas``."""

from __future__ import annotations

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import Response

from ingest_api.http.auth import require
from ingest_api.http.body import read_body
from ingest_api.http.routers.schemas import (
    MAX_BODY,
    Flag,
    Subject,
    allow,
    answer,
    read_json,
    registry_of,
    served,
)

router = APIRouter(tags=["schema registry"])


class LevelBody(msgspec.Struct):
    compatibility: str | None = None
    compatibilityLevel: str | None = None


class ModeBody(msgspec.Struct):
    mode: str


_level_body = msgspec.json.Decoder(LevelBody)
_mode_body = msgspec.json.Decoder(ModeBody)


@router.get("/config")
async def get_global_level(request: Request) -> Response:
    return await _get_level(request, None, True)


@router.get("/config/{subject}")
async def get_subject_level(subject: Subject, request: Request,
                            defaultToGlobal: Flag = False) -> Response:
    allow(request, subject, "describe")
    return await _get_level(request, subject, defaultToGlobal)


async def _get_level(request: Request, subject: str | None, to_global: bool) -> Response:
    reg = await served(request)
    if isinstance(reg, Response):
        return reg
    return answer({"compatibilityLevel": registry_of(request).subject_level(reg, subject,
                                                                           to_global)})


@router.put("/config")
async def set_global_level(request: Request) -> Response:
    allow(request, None, "alter")
    return await _set_level(request, None)


@router.put("/config/{subject}")
async def set_subject_level(subject: Subject, request: Request) -> Response:
    allow(request, subject, "alter")
    return await _set_level(request, subject)


async def _set_level(request: Request, subject: str | None) -> Response:
    body = read_json(request, await read_body(request, MAX_BODY), _level_body)
    reg = await served(request)
    if isinstance(reg, Response):
        return reg
    name = await registry_of(request).set_level(subject, body.compatibility or
                                              body.compatibilityLevel)
    return answer({"compatibility": name})


@router.delete("/config")
async def delete_global_level(request: Request) -> Response:
    allow(request, None, "alter")
    return await _delete_level(request, None)


@router.delete("/config/{subject}")
async def delete_subject_level(subject: Subject, request: Request) -> Response:
    allow(request, subject, "alter")
    return await _delete_level(request, subject)


async def _delete_level(request: Request, subject: str | None) -> Response:
    reg = await served(request)
    if isinstance(reg, Response):
        return reg
    return answer({"compatibilityLevel": await registry_of(request).delete_level(subject)})


@router.get("/mode")
async def get_global_mode(request: Request) -> Response:
    return await _get_mode(request, None, True)


@router.get("/mode/{subject}")
async def get_subject_mode(subject: Subject, request: Request,
                           defaultToGlobal: Flag = False) -> Response:
    allow(request, subject, "describe")
    return await _get_mode(request, subject, defaultToGlobal)


async def _get_mode(request: Request, subject: str | None, to_global: bool) -> Response:
    reg = await served(request)
    if isinstance(reg, Response):
        return reg
    return answer({"mode": registry_of(request).subject_mode(reg, subject, to_global)})


@router.put("/mode")
async def set_global_mode(request: Request) -> Response:
    allow(request, None, "alter")
    return await _set_mode(request, None)


@router.put("/mode/{subject}")
async def set_subject_mode(subject: Subject, request: Request) -> Response:
    allow(request, subject, "alter")
    return await _set_mode(request, subject)


async def _set_mode(request: Request, subject: str | None) -> Response:
    body = read_json(request, await read_body(request, MAX_BODY), _mode_body)
    if str(body.mode).upper() == "IMPORT":  # takes ids and versions: the cluster's to give
        require(request, "cluster", "lakelog", "admin")
    reg = await served(request)
    if isinstance(reg, Response):
        return reg
    return answer({"mode": await registry_of(request).set_mode(subject, body.mode)})


@router.delete("/mode/{subject}")
async def delete_subject_mode(subject: Subject, request: Request) -> Response:
    allow(request, subject, "alter")
    reg = await served(request)
    if isinstance(reg, Response):
        return reg
    return answer({"mode": await registry_of(request).delete_mode(subject)})
