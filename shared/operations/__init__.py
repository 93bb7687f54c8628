"""Operations: changes that span tables and steps (operator actions on tasks, bulk fixes,
emergency stop, configuring, datasets, harvest, resubmission, loss, quarantine), built on the
store and the domain."""
