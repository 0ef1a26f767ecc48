"""One router per area of the console."""
