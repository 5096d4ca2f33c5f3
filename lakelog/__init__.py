"""The top floor, what users touch: the ``lakelog`` command line (``cli/``), the Python
client (``client/``), the SQL endpoint (``endpoint/``), the public import paths
(``lakelog.log``, ``lakelog.spark``), the SQL views that compose ``log_tables`` and
``consumer_groups``, and the settings that compose every package's own (``settings``).
It imports every floor below; none imports it.
"""

__version__ = "0.1.0"
