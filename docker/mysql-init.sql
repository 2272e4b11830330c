-- The XA sink rolls back prepared branches its crashed predecessor left (XA RECOVER), which
-- MySQL 8 allows only with XA_RECOVER_ADMIN. MariaDB (scripts/services) needs no grant.
GRANT XA_RECOVER_ADMIN ON *.* TO 'exactly'@'%';
FLUSH PRIVILEGES;
