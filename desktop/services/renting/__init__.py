"""Renting: machines rented for runs, recorded before they are asked for, watched, recovered, terminated until gone."""
