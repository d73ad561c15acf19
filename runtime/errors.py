"""Errors a user of the runtime can hit; the CLIs print their message without a traceback."""


class AtlasError(Exception):
    """Base of user-facing runtime errors."""


class EngineError(AtlasError):
    """An engine directory the runtime cannot use; the message says what to rebuild."""


class RequestError(AtlasError):
    """A request the engine cannot serve as asked (prompt too long, invalid sampling parameters)."""
