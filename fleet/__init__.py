"""Fleet learning (draft)."""
