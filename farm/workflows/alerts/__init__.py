"""`farm alerts check`: steps (judge a stored sweep, raise, send), run (the workflow)."""
