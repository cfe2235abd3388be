"""django-rq with rq-epoch: the lines to add to your Django settings.

Workers started with ``python manage.py rqworker`` then stamp their leases with the server
epoch, and ``rq-epoch sweep`` (from cron) judges expired ones. Job classes and worker
classes are global settings in django-rq.

A job's own stall budget is given at enqueue time through rq_epoch.Queue::

    import django_rq
    from rq_epoch import Queue

    queue = Queue('default', connection=django_rq.get_connection('default'))
    queue.enqueue('billing.tasks.charge_card', order_id, max_stalled=1)

Sweep from cron with the same server:  rq-epoch sweep --url "$REDIS_URL" --all --quiet
"""

import os

REDIS_URL = os.environ.get('REDIS_URL', 'redis://127.0.0.1:6379/0')

RQ_QUEUES = {
    'default': {'URL': REDIS_URL, 'DEFAULT_TIMEOUT': 360},
    'high': {'URL': REDIS_URL, 'DEFAULT_TIMEOUT': 500},
}

RQ = {
    'WORKER_CLASS': 'rq_epoch.Worker',
    'JOB_CLASS': 'rq_epoch.Job',
}
