"""kvdoctor.signals: the plumbing every layer reads. The signal vocabulary, the window and its
statistics, the exposition parser and writer, the trace format, units, the collector contract.
Pure: takes values, no I/O."""
