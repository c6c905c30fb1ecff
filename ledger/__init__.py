"""kvdoctor.ledger: how fast decode can be. The bandwidth and capacity arithmetic, the GPU catalogue,
the model's shape, the what-ifs and the labelled report. Pure: takes values, no I/O."""
