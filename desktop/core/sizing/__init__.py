"""Sizing a fine-tune before renting: memory per GPU, throughput, hours and dollars.

Pure functions over plain data: model architectures, training setups and GPU specs go in, itemised estimates come
out. Loading catalogs and configs is done by :mod:`desktop.services.models.configs`.
"""
