"""Ingestion, in the order ``stages.programs.raw_documents`` composes it: ``files`` (which files,
refused or read, and their identity), ``streams`` (decompression, lines, store errors vs damage),
``tasks`` (pieces that parse in parallel), ``records`` (each record judged on its own), ``ids``
(content-derived doc_ids) and ``writer`` (ids in input order, parts, duplicate record ids)."""
