"""Jobs (SPEC §4.7): the supervisor that carries out the job machine (core/jobs.py), one process
group per job, and the job ops."""
