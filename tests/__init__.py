"""The looptool test-suite, one subpackage per layer (a failing test names its layer)."""
