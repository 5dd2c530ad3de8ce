"""The user's bucket: an S3-compatible object store (S3, R2, B2, Wasabi, MinIO) reached with boto3.

Only this package talks to buckets or imports boto3 (an import contract says so). The bucket's keys come from the
keyring (or ``RENTUNE_BUCKET_KEY_ID`` / ``RENTUNE_BUCKET_SECRET``) and never leave this computer.
"""
