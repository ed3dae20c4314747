"""`courier bench`: each scenario measures Courier and its own ceiling in the same run."""
