"""kvdoctor exporter.collectors"""
