"""The two ways a run ends on purpose: a user error (exit 2) and a failed check (exit 1)."""


class UserError(Exception):
    """Unusable input or usage: printed as one line naming the flag or file, exit status 2."""

    exit_code = 2


class CheckFailed(UserError):
    """A check found problems (validate, info on a damaged dataset): exit status 1."""

    exit_code = 1
