"""One FastAPI router per resource of Confluent's REST v3 (and lakelog's own): each
route decodes its request, calls one service of the broker core and encodes the answer."""
