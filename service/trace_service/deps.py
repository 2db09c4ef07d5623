"""Dependencies as Annotated aliases: handlers declare what they need, tests override it.

They are ``async def`` although they never await: FastAPI runs a plain ``def`` dependency in a worker
thread, a thread hand-off on every request."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from trace_service.engine import Engine
from trace_service.settings import Settings


async def get_engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


EngineDep = Annotated[Engine, Depends(get_engine)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
