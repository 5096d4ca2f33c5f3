"""The HTTP front of the broker (Confluent REST v3 shapes): the FastAPI app, its
routers, request models and body parsing, authentication, and the mapping of lakelog's
errors to HTTP statuses and Confluent error codes. Routers decode, call the broker, encode."""
