"""lakelog's tests. Importing the package first puts each pytest-xdist worker's own port
range in place (``tests.ports``), before any module takes ``free_port`` by name."""

from tests import ports

ports.install()
