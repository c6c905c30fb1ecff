"""kvdoctor exporter.simulator"""
