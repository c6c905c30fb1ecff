"""kvdoctor.simulator: the simulated engine and GPU behind ``kvdoctor demo`` and the tests."""
