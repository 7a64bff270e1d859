"""Share groups (KIP-932): share-partition state and share sessions on partition leaders."""
