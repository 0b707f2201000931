"""Moving reuse specs from one upstream release to the next (``ci-relay upgrade``).

``release_diff`` compares two releases test by test; ``spec_impact`` says what that does to
each spec and proposes the span edits. The selector never uses this package.
"""
