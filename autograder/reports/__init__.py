"""What people read: the grade table, the class report, feedback pages, similar submissions."""
