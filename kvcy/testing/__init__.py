"""Testing helpers shipped with kvcy (the golden-vector replayer)."""
