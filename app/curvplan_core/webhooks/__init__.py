"""The address policy of webhook callbacks, shared by the API (at submission) and the sender."""
