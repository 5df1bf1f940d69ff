"""rlq's stand-in for the `slime` package: only the types a slime user's plugin imports.

The plugin host puts this directory last on sys.path, so an installed slime wins.
"""
