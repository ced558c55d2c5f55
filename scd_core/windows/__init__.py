"""Windows: how wide each call is.  The window settings (window_policies: a pinned width or a named policy),
the automatic window and the call costs it measures (auto_window), and what it learned, kept per model across
processes (window_memory).

Imports the adapter protocol (scd_core.model) only."""
