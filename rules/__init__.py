"""kvdoctor.rules: the signal vocabulary, the decision tree, the ledger, the alert rules. Pure, no I/O."""
