"""kvdoctor.stress: the KV-cache pressure test (load generator, recorders, report)."""
