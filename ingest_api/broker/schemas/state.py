"""The registry's state: moved to ``log_tables.typed.registry_state`` (the typed tables'
job reads it too); kept here for the broker's modules."""

from log_tables.typed.registry_state import (
    Record,
    RegistryState,
    Version,
    id_record,
    setting_record,
    version_record,
)

__all__ = ["Record", "RegistryState", "Version", "id_record", "setting_record", "version_record"]
