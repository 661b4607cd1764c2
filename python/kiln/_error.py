"""kiln.Error: every failure of the package, carrying kiln's message and error code."""


class Error(Exception):
    """A kiln call failed. ``code`` is kiln's error code (``kiln_err``, an int; the bindings
    give arguments they refuse before any C call KILN_ERR_USAGE, 5; 0 where no kiln code
    applies), ``message`` the text kiln reported."""

    def __init__(self, message, code=0):
        super().__init__(message)
        self.message = message
        self.code = code

    def __str__(self):
        return self.message
