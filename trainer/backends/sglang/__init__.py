"""The SGLang rollout engine (``--rollout-backend sglang``): the engine, and its ServerArgs from
train.py's argv, checked against SGLang's fields (the pinned release's table where SGLang is not
installed)."""
