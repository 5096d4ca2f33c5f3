"""Moved to ``lakelog.spark`` (deprecated path, kept working)."""

from log_tables.moved import moved

_SESSION = "log_tables.spark.session"
__getattr__ = moved(__name__, {"lakelog_session": "lakelog.spark", "attach": "lakelog.spark",
                               "session_layout": _SESSION, "CONF_DATA_DIR": _SESSION,
                               "CONF_WAREHOUSE": _SESSION, "SESSION_CONF": _SESSION})
