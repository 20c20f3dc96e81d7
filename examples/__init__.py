"""Example handlers and the sample jobs `rsched dev` schedules (`make demo`)."""
