"""One module per stage: the domain function a stage handler calls."""
