"""The pipeline: import, saturate, extract, lower and verify, for every backend alike."""
