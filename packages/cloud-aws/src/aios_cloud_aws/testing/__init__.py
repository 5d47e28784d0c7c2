"""Test stand-ins for AWS, for this package's tests and anyone testing on top of it:

* :mod:`aios_cloud_aws.testing.moto` — a moto server (``ThreadedMotoServer`` on 127.0.0.1) the
  real boto3 talks to, and helpers to seed what moto lacks (the public DLAMI SSM parameters).
* :mod:`aios_cloud_aws.testing.ec2proxy` — an HTTP proxy in front of moto's EC2 API that
  answers chosen calls with AWS errors (``InsufficientInstanceCapacity`` in chosen zones,
  ``ExpiredToken``, ``UnauthorizedOperation``), records requests, and serves the placement-group
  calls moto does not implement.
* :mod:`aios_cloud_aws.testing.imds` — an IMDSv2 stand-in (token + spot instance-action;
  ``ImdsServer.interrupt`` also ends an :class:`aios_cloud.testing.host.Host` at the notice's time).
"""
