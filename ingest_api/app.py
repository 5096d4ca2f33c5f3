"""Moved: the app factory is the HTTP front's, ``ingest_api.http.app``."""

from log_tables.moved import moved

__getattr__ = moved(__name__, {"create_app": "ingest_api.http.app"})
