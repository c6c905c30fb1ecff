"""kvdoctor exporter.adapters"""
