"""RQ's classes with the epoch behaviour, used by every layer above: the job and its started
registry (:mod:`.job`), the epoch variant of any job class (:mod:`.jobclass`), the queue
(:mod:`.queue`)."""
