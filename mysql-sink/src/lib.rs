//! `exactly-mysql-sink`: a MySQL/MariaDB sink with XA two-phase commit or idempotent upserts.
