"""The errors of a request's form, of security and of admin look-ups, and of the server's
own processes: part of ``log_tables.errors``'s one table, which gathers them (import them
from there). A client reads these by their name (``error``), not as classes. Each says
(kafka_name, code) on one line, and ``retriable`` where trying again can succeed.
"""

from __future__ import annotations

from log_tables.error_root import LakelogError

# -- a request's form (the fronts' parsing of it) ----------------------------------------


class BadRequestError(LakelogError):
    """A request a front cannot read (a Content-Length that is not a number)."""
    kafka_name, code = "INVALID_REQUEST", "bad_request"


class InvalidRequestError(LakelogError):
    """A request whose fields do not fit together or are of the wrong shape. ``detail``
    ``MALFORMED``: the form of it (a query, an admin body) rather than what it asks."""
    kafka_name, code = "INVALID_REQUEST", "invalid_request"


MALFORMED = "malformed"
"""``InvalidRequestError.detail`` and ``EmptyBodyError.detail`` of a request's form."""


class InvalidParameterError(LakelogError):
    """A query or path parameter that is not what it takes."""
    kafka_name, code = "INVALID_REQUEST", "invalid_parameter"


class MalformedJsonError(LakelogError):
    """A body that is not JSON (or not UTF-8, or nested too deep)."""
    kafka_name, code = "INVALID_REQUEST", "malformed_json"


class InvalidBase64Error(LakelogError):
    """BINARY data or a header value that is not base64."""
    kafka_name, code = "INVALID_REQUEST", "invalid_base64"


class EmptyBodyError(LakelogError):
    """A request without the body it needs."""
    kafka_name, code = "INVALID_REQUEST", "empty_body"


class UnsupportedMediaTypeError(LakelogError):
    """A body sent as something other than JSON in UTF-8."""
    code = "unsupported_media_type"


class RequestTooLargeError(LakelogError):
    """A body over the server's bound on one request."""
    code = "request_too_large"


class TooManyRequestsError(LakelogError):
    """The server is at its bound of request bytes in flight: try again shortly."""
    kafka_name, code, retriable = "THROTTLING_QUOTA_EXCEEDED", "too_many_requests", True


class ServiceUnavailableError(LakelogError):
    """The server is at its bound of open connections and requests: try again shortly."""
    code, retriable = "service_unavailable", True


class MalformedHttpError(LakelogError):
    """A request line or head that is not HTTP/1.1."""
    code = "malformed_http"


class RequestTimeoutError(LakelogError):
    """A request head (or body) that did not arrive within the server's bound: nothing of
    the request was done, so sending it again is safe (Kafka's REQUEST_TIMED_OUT is
    retriable too). A nemesis run found it raised as final by a transactional producer
    whose write a peer had answered 408 after a partition between brokers."""
    kafka_name, code, retriable = "REQUEST_TIMED_OUT", "request_timeout", True


class RequestHeaderTooLargeError(LakelogError):
    """A request head over the server's bound."""
    code = "request_header_too_large"


class HttpError(LakelogError):
    """What HTTP itself refuses: no such endpoint, a method the path does not take."""
    code = "http_error"


class ClientDisconnectedError(LakelogError):
    """The client left before its request body was complete."""
    code = "client_disconnected"


class BrokerAnswerError(LakelogError):
    """Another broker's answer that is not an error body of lakelog's."""
    code = "broker_error"


class InvalidBatchError(LakelogError):
    """A batch of records that is not one (an entry without its id, ids repeated)."""
    kafka_name, code = "INVALID_REQUEST", "invalid_batch"


class EmptyBatchError(LakelogError):
    """A batch without entries."""
    kafka_name, code = "INVALID_REQUEST", "empty_batch"


class TooManyEntriesError(LakelogError):
    """A batch over the server's bound of entries a request."""
    code = "too_many_entries"


class InvalidOffsetTypeError(LakelogError):
    """An offset type other than the ones a partition's offsets are asked by."""
    kafka_name, code = "INVALID_REQUEST", "invalid_offset_type"


# -- security ----------------------------------------------------------------------------


class AuthenticationFailedError(LakelogError):
    """No key, an unknown key or a wrong secret."""
    kafka_name, code = "SASL_AUTHENTICATION_FAILED", "authentication_failed"


class AuthorizationFailedError(LakelogError):
    """No ACL allows the principal the operation (Kafka names one per resource type:
    TOPIC_, GROUP_, CLUSTER_AUTHORIZATION_FAILED; this is the cluster's)."""
    kafka_name, code = "CLUSTER_AUTHORIZATION_FAILED", "authorization_failed"


class ImpersonationRefusedError(LakelogError):
    """A request that acts for another principal from a key that may not."""
    kafka_name, code = "CLUSTER_AUTHORIZATION_FAILED", "impersonation_refused"


class InvalidPrincipalError(LakelogError):
    """A principal name that cannot be (or is a broker's, which no user key may take)."""
    code = "invalid_principal"


class InvalidAclError(LakelogError):
    """An ACL that cannot be: an unknown operation, resource type or pattern."""
    kafka_name, code = "INVALID_REQUEST", "invalid_acl"


class UnknownAclError(LakelogError):
    """A deletion of an ACL that does not exist."""
    kafka_name, code = "RESOURCE_NOT_FOUND", "unknown_acl"


class UnknownApiKeyError(LakelogError):
    """An API key id that does not exist."""
    kafka_name, code = "RESOURCE_NOT_FOUND", "unknown_api_key"


class SecurityDisabledError(LakelogError):
    """Keys and ACLs asked of a server without authentication (LAKELOG_AUTH=none)."""
    kafka_name, code = "SECURITY_DISABLED", "security_disabled"


# -- look-ups of admin calls -------------------------------------------------------------


class NotFoundError(LakelogError):
    """A path that names no resource (an id out of range)."""
    kafka_name, code = "RESOURCE_NOT_FOUND", "not_found"


class UnknownClusterError(LakelogError):
    """A cluster id other than this cluster's."""
    kafka_name, code = "INCONSISTENT_CLUSTER_ID", "unknown_cluster"


class UnknownBrokerError(LakelogError):
    """A broker id that no broker of the cluster has."""
    kafka_name, code = "BROKER_ID_NOT_REGISTERED", "unknown_broker"


class UnknownReplicaError(LakelogError):
    """A broker that holds no replica of the partition."""
    kafka_name, code = "RESOURCE_NOT_FOUND", "unknown_replica"


class NoReassignmentError(LakelogError):
    """No replica reassignment of the partition is in progress."""
    kafka_name, code = "NO_REASSIGNMENT_IN_PROGRESS", "no_reassignment"


class UnknownConfigError(LakelogError):
    """A topic config named in a request's path that does not exist."""
    kafka_name, code = "RESOURCE_NOT_FOUND", "unknown_config"


class NoOffsetsError(LakelogError):
    """A consumer group that reads no partition: it has no lag to show."""
    kafka_name, code = "RESOURCE_NOT_FOUND", "no_offsets"


class NotAClusterError(LakelogError):
    """A replica fetch from a server that is not a broker of a cluster."""
    code = "not_a_cluster"


# -- the server's own processes ----------------------------------------------------------


class InternalError(LakelogError):
    """What no other error is: a bug (the front answers an unexpected exception so)."""
    kafka_name, code = "UNKNOWN_SERVER_ERROR", "internal_error"


class PortTakenError(LakelogError):
    """A port of the SQL endpoint is another process's."""
    code = "port_taken"


class EndpointUnavailableError(LakelogError):
    """The SQL endpoint did not answer, or went away during the call (it stopped, its Spark
    died): not an error of the query."""
    code, retriable = "endpoint_unavailable", True


REQUEST_ERRORS: tuple[type[LakelogError], ...] = (
    BadRequestError, InvalidRequestError, InvalidParameterError, MalformedJsonError,
    InvalidBase64Error, EmptyBodyError, UnsupportedMediaTypeError, RequestTooLargeError,
    TooManyRequestsError, ServiceUnavailableError, MalformedHttpError, RequestTimeoutError,
    RequestHeaderTooLargeError, HttpError, ClientDisconnectedError, BrokerAnswerError,
    InvalidBatchError, EmptyBatchError, TooManyEntriesError, InvalidOffsetTypeError,
    AuthenticationFailedError, AuthorizationFailedError, ImpersonationRefusedError,
    InvalidPrincipalError, InvalidAclError, UnknownAclError, UnknownApiKeyError,
    SecurityDisabledError, NotFoundError, UnknownClusterError, UnknownBrokerError,
    UnknownReplicaError, NoReassignmentError, UnknownConfigError, NoOffsetsError,
    NotAClusterError, InternalError, PortTakenError, EndpointUnavailableError,
)
"""This module's errors, for the table."""

__all__ = [
    "MALFORMED",
    "REQUEST_ERRORS",
    "AuthenticationFailedError",
    "AuthorizationFailedError",
    "BadRequestError",
    "BrokerAnswerError",
    "ClientDisconnectedError",
    "EmptyBatchError",
    "EmptyBodyError",
    "EndpointUnavailableError",
    "HttpError",
    "ImpersonationRefusedError",
    "InternalError",
    "InvalidAclError",
    "InvalidBase64Error",
    "InvalidBatchError",
    "InvalidOffsetTypeError",
    "InvalidParameterError",
    "InvalidPrincipalError",
    "InvalidRequestError",
    "MalformedHttpError",
    "MalformedJsonError",
    "NoOffsetsError",
    "NoReassignmentError",
    "NotAClusterError",
    "NotFoundError",
    "PortTakenError",
    "RequestHeaderTooLargeError",
    "RequestTimeoutError",
    "RequestTooLargeError",
    "SecurityDisabledError",
    "ServiceUnavailableError",
    "TooManyEntriesError",
    "TooManyRequestsError",
    "UnknownAclError",
    "UnknownApiKeyError",
    "UnknownBrokerError",
    "UnknownClusterError",
    "UnknownConfigError",
    "UnknownReplicaError",
    "UnsupportedMediaTypeError",
]
