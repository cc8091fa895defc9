"""The feature store: its layout on disk and manifest (layout), reading (reader, rows, ids), the one writer
(writer), `store verify|info` (verify), `store migrate|compact` (maintain), the public `headstore.Store` (api)."""
