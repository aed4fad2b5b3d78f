"""The SGLang backend: its knob registry (``knobs``), its parser-driven flag check (``cli``, stdlib
only: it runs inside the contract venv), its ``/generate`` benchmark client (``client``) and the
``Backend`` itself (``backend``)."""
