"""kvdoctor.dashboard: the Dash app on-call opens during a latency incident."""
