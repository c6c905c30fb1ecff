"""kvdoctor.exporter: collectors, engine adapters, the ring store and the HTTP app."""
