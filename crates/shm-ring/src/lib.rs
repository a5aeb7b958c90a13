//! shm-ring
