"""aios cloud provider for AWS EC2 (GPU P4d/P5/P5e and Trainium Trn1/Trn2).

Importing this package is cheap: boto3 is imported inside the functions that call AWS.
"""

from aios_cloud_aws.__about__ import __version__

__all__ = ["__version__"]
