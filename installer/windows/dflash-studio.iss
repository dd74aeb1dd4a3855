; Inno Setup 6 script for DFlash Studio (Windows x64).
; Build on Windows after the PyInstaller bundle exists (installer\windows\build.ps1 does both):
;   iscc installer\windows\dflash-studio.iss
; Input:  dist\installer\dflash-studio\   (dflash-studio.exe, dflash-studio-cli.exe, _internal\)
; Output: dist\installer\DFlashStudio-<version>-setup.exe
; docs\installer.md has the how-to.

#define AppName "DFlash Studio"
#define AppVersion "0.1.0"
#define AppExe "dflash-studio.exe"
#define CliExe "dflash-studio-cli.exe"
; Paths are relative to this script (installer\windows\).
#define Repo "..\.."
#define Bundle Repo + "\dist\installer\dflash-studio"

[Setup]
; A fixed AppId keeps upgrades and the uninstaller tied to one product: never change it.
AppId={{6C1F8C2E-4E7B-4B8A-9D55-0F3A2B7D1E91}
AppName={#AppName}
AppVersion={#AppVersion}
AppVerName={#AppName} {#AppVersion}
AppPublisher=DFlash Studio developers
DefaultDirName={autopf}\{#AppName}
DefaultGroupName={#AppName}
DisableProgramGroupPage=yes
; Per-user install by default (no admin prompt); the dialog lets an admin install for everyone.
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
MinVersion=10.0
OutputDir={#Repo}\dist\installer
OutputBaseFilename=DFlashStudio-{#AppVersion}-setup
SetupIconFile=dflash-studio.ico
UninstallDisplayIcon={app}\{#AppExe}
Compression=lzma2/max
SolidCompression=yes
LZMANumBlockThreads=4
WizardStyle=modern
ChangesEnvironment=no

[Languages]
Name: "english"; MessagesFile: "compiler:Default.isl"

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked
Name: "installmodel"; Description: "Install the default model (SmolLM2-135M-Instruct, about 140 MB) into my user data folder now"; GroupDescription: "First run:"

[Files]
Source: "{#Bundle}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{autoprograms}\{#AppName}"; Filename: "{app}\{#AppExe}"; WorkingDir: "{app}"
Name: "{autodesktop}\{#AppName}"; Filename: "{app}\{#AppExe}"; WorkingDir: "{app}"; Tasks: desktopicon

[Run]
; Copies the bundled model into %LOCALAPPDATA%\dflash-studio\models as the person who ran setup
; (not as the elevated admin). A bundle built with --no-default-model exits 2 here and setup
; goes on; the app then explains the other ways on first start.
Filename: "{app}\{#CliExe}"; Parameters: "prepare --quiet"; StatusMsg: "Installing the default model..."; \
  Flags: runasoriginaluser runhidden waituntilterminated; Tasks: installmodel
Filename: "{app}\{#AppExe}"; Description: "{cm:LaunchProgram,{#AppName}}"; \
  Flags: nowait postinstall skipifsilent runasoriginaluser

[UninstallDelete]
; Models, chat history and settings live in the user data folder and are kept on uninstall
; (docs\installer.md says where and how to remove them).
Type: filesandordirs; Name: "{app}\_internal\__pycache__"
