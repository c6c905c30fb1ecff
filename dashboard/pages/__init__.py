"""kvdoctor dashboard.pages"""
